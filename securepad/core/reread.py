"""The re-read report of a turn (``Turn.reread_report``), as pure functions.

A compaction mark keeps a ``fingerprint`` of each entry the turn held (sealed
inside the mark); ``report`` compares the entries recorded after the mark with
it: what was fetched again although it had been stored before, by the same
path (observation metadata ``path`` or ``url``) or identical content (the
keyed per-owner content identity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["fingerprint", "report"]


def fingerprint(row: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a compaction mark keeps of an entry (sealed inside the mark), from
    its authorized row and its opened metadata."""
    return {
        "id": row["id"],
        "step_num": row["step_num"],
        "executor_name": row["executor_name"],
        "path": _path_of(meta["view"]),
        "content_id": meta.get("content_id"),
    }


def report(turn_id: str, mark: Mapping[str, Any] | None, entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``Turn.reread_report``'s answer: ``mark`` is the turn's newest compaction
    mark (or None), ``entries`` the fingerprints of the turn's live entries now."""
    result: dict[str, Any] = {
        "turn_id": turn_id,
        "mark": None,
        "stored_before": 0,
        "fetched_after": 0,
        "rereads": [],
        "reread_count": 0,
        "same_path": 0,
        "same_content": 0,
        "reread_paths": [],
        "ratio": 0.0,
    }
    if mark is None:
        return result
    before = mark["payload"]["entries"]
    before_ids = {item["id"] for item in before}
    first_by_path: dict[str, int] = {}
    first_by_content: dict[str, int] = {}
    for item in before:
        if item["path"] is not None:
            first_by_path.setdefault(item["path"], item["step_num"])
        if item["content_id"] is not None:
            first_by_content.setdefault(item["content_id"], item["step_num"])
    after = [item for item in entries if item["id"] not in before_ids]
    rereads = []
    for item in after:
        same_path = item["path"] is not None and item["path"] in first_by_path
        same_content = item["content_id"] is not None and item["content_id"] in first_by_content
        if not (same_path or same_content):
            continue
        firsts = [first_by_path[item["path"]]] if same_path else []
        if same_content:
            firsts.append(first_by_content[item["content_id"]])
        rereads.append(
            {
                "step_num": item["step_num"],
                "scratchpad_id": item["id"],
                "executor_name": item["executor_name"],
                "path": item["path"],
                "same_path": same_path,
                "same_content": same_content,
                "first_step": min(firsts),
            }
        )
    result.update(
        mark={"seq": mark["seq"], "created_at": mark["created_at"]},
        stored_before=len(before),
        fetched_after=len(after),
        rereads=rereads,
        reread_count=len(rereads),
        same_path=sum(r["same_path"] for r in rereads),
        same_content=sum(r["same_content"] for r in rereads),
        reread_paths=sorted({r["path"] for r in rereads if r["same_path"]}),
        ratio=len(rereads) / len(after) if after else 0.0,
    )
    return result


def _path_of(view: Mapping[str, Any]) -> str | None:
    metadata = view.get("metadata")
    for source in (metadata if isinstance(metadata, Mapping) else {}, view):
        for key in ("path", "url"):
            value = source.get(key)
            if isinstance(value, str) and value:
                return value
    return None
