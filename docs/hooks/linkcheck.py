"""Check every link of a built site: each internal href names a page or file that exists and, with a #fragment, an
id on that page. External links (http, https, mailto) are listed, not fetched: the build runs without a network.

    python docs/hooks/linkcheck.py SITE_DIR        # prints one line per broken link; exit 1 if any
"""

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for attr in ("href", "src"):
            if a.get(attr) and tag in ("a", "img", "link", "script"):
                self.links.append(a[attr])


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


def _target(site: Path, page: Path, url_path: str) -> Path:
    t = (site / url_path.lstrip("/")) if url_path.startswith("/") else (page.parent / url_path)
    t = t.resolve()
    if t.is_dir():
        t = t / "index.html"
    return t


def check(site: Path) -> tuple[list[str], int, set[str]]:
    """(broken links as 'page: href (why)', internal links checked, external URLs seen)."""
    site = site.resolve()
    pages = {p.resolve(): _parse(p) for p in site.rglob("*.html")}
    broken, checked, external = [], 0, set()
    for page, parsed in pages.items():
        for href in parsed.links:
            parts = urlsplit(href)
            if parts.scheme in ("http", "https", "mailto", "data", "javascript") or href.startswith("//"):
                if parts.scheme in ("http", "https"):
                    external.add(href)
                continue
            path, frag = unquote(parts.path), unquote(parts.fragment)
            target = _target(site, page, path) if path else page
            checked += 1
            rel = page.relative_to(site)
            if not str(target).startswith(str(site)):
                broken.append(f"{rel}: {href} (outside the site)")
            elif not target.exists():
                broken.append(f"{rel}: {href} (no such page or file)")
            elif frag and target.suffix == ".html" and target in pages and frag not in pages[target].ids:
                broken.append(f"{rel}: {href} (no #{frag} on that page)")
    return broken, checked, external


def main(argv: list[str]) -> int:
    site = Path(argv[0] if argv else "site")
    broken, checked, external = check(site)
    for b in broken:
        print(b)
    print(f"{checked} internal links checked, {len(broken)} broken; {len(external)} external links not fetched",
          file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
