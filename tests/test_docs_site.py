"""The built docs site: it builds with ``--strict`` and makes no request to another host.

A security tool's documentation should not tell a font service or a CDN who
reads it: the pages use the system's fonts (``theme.font: false``), and no
page, stylesheet or script of the site loads anything from elsewhere.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Building the site costs seconds (mkdocs with the theme and its plugins).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# A tag that makes the browser fetch what it names (a link, <a>, is not a request).
_FETCHING_TAG = re.compile(r"<(?:link|script|img|iframe|source|video|audio|embed|object)\b[^>]*>", re.I)
_OUTSIDE = re.compile(r"""(?:href|src|srcset|data)\s*=\s*["']?(?:https?:)?//""", re.I)
_CSS_OUTSIDE = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])(?:https?:)?//""", re.I)
# Hosts that serve fonts or scripts to many sites.
_FONT_OR_CDN_HOSTS = re.compile(
    r"fonts\.googleapis|fonts\.gstatic|use\.typekit|cdn\.jsdelivr|cdnjs\.cloudflare|fonts\.bunny", re.I
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _files(site: Path, *suffixes: str) -> list[Path]:
    return [path for path in site.rglob("*") if path.suffix in suffixes]


def test_no_page_loads_anything_from_another_host(site: Path) -> None:
    pages = _files(site, ".html")
    assert len(pages) > 20
    for page in pages:
        text = page.read_text(encoding="utf-8")
        outside = [tag for tag in _FETCHING_TAG.findall(text) if _OUTSIDE.search(tag)]
        assert outside == [], (page.relative_to(site), outside)
        for style in re.findall(r"<style\b[^>]*>(.*?)</style>", text, re.S | re.I):
            assert not _CSS_OUTSIDE.search(style), page.relative_to(site)


def test_no_stylesheet_or_script_names_a_font_service_or_cdn(site: Path) -> None:
    stylesheets = _files(site, ".css")
    assert stylesheets
    for sheet in stylesheets:
        text = sheet.read_text(encoding="utf-8")
        assert not _CSS_OUTSIDE.search(text), sheet.relative_to(site)
    for asset in [*stylesheets, *_files(site, ".js", ".html")]:
        assert not _FONT_OR_CDN_HOSTS.search(asset.read_text(encoding="utf-8")), asset.relative_to(site)


def test_code_in_tables_is_never_broken_mid_word(site: Path) -> None:
    """Identifiers in table cells (``SECUREPAD_KEY_FILE``) stay whole; the prose around them wraps."""
    css = "".join(path.read_text(encoding="utf-8") for path in _files(site, ".css"))
    rule = re.search(r"\.md-typeset table:not\(\[class\]\) code\s*\{([^}]*)\}", css)
    assert rule is not None and "white-space: nowrap" in rule.group(1)
    assert "extra.css" in (site / "index.html").read_text(encoding="utf-8")


def test_the_api_page_documents_every_method_of_the_store(site: Path) -> None:
    """``Scratchpad``'s methods are its own and its faces' (``Housekeeping``,
    ``Place``): the page shows the inherited ones too."""
    import inspect

    from securepad import Scratchpad

    page = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    defined = set()
    for name in dir(Scratchpad):
        member = inspect.getattr_static(Scratchpad, name)
        func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        # A method written in a class (not a module's function set as a static method).
        if not name.startswith("_") and inspect.isfunction(func) and func.__qualname__.endswith(f".{name}"):
            defined.add(name)
    assert {"put", "gc", "verify", "backup", "restore", "location"} <= defined
    assert [name for name in sorted(defined) if f'id="securepad.Scratchpad.{name}"' not in page] == []
