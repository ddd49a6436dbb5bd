"""The backends: SQLite through apsw, PostgreSQL through psycopg; files, the anchor, the schema."""
