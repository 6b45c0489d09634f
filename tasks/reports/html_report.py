"""The run report as one self-contained HTML page (``reports/evaluate.html``): the figures inlined
as ``data:image/png;base64`` URIs, then ``reports/evaluate.md`` rendered to HTML. No script, no
stylesheet or font from elsewhere: the page opens offline, from disk, in any browser, and can be
mailed as one file."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1280px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; }
figure { margin: 16px 0 28px; } figure img { max-width: 100%; height: auto;
  border: 1px solid #ddd; } figcaption { color: #555; font-size: 0.92em; margin-top: 4px; }
table { border-collapse: collapse; font-size: 0.82em; margin: 8px 0; display: block;
  overflow-x: auto; } th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
code { background: #f3f3f3; padding: 0 3px; } nav a { margin-right: 12px; }
"""


@dataclass(frozen=True)
class Figure:
    """One figure of the page: ``name`` (its anchor and file stem), a caption, the PNG bytes."""

    name: str
    caption: str
    png: bytes


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def markdown_html(text: str) -> str:
    """CommonMark with tables (markdown-it-py, which rich already brings); raw HTML in the text is
    escaped, not passed through."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def render_html(title: str, figures: list[Figure], markdown: str) -> str:
    """The page: ``title``, a table of contents, every figure (``<img>`` with its caption as alt
    text), then ``markdown`` (the tables) as HTML."""
    if not figures:
        raise ValueError("the run report needs at least one figure")
    nav = " ".join(
        f'<a href="#{html.escape(f.name)}">{html.escape(f.caption.split(":")[0])}</a>'
        for f in figures
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<nav>{nav} <a href="#tables">tables</a></nav>',
    ]
    for f in figures:
        caption = html.escape(f.caption)
        parts.append(
            f'<figure id="{html.escape(f.name)}"><img src="{data_uri(f.png)}" alt="{caption}">'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    parts += ['<section id="tables">', markdown_html(markdown), "</section>", "</body>", "</html>"]
    return "\n".join(parts) + "\n"
