"""The only importers of AESGCM, HKDF and HMAC: key handles, wrapping, the sealed formats."""
