"""``report.html``: report.md as one self-contained page (figures embedded as base64 PNG).

The MLflow UI shows an ``.html`` artifact in a sandboxed iframe, so the page must carry
everything itself: no external CSS, scripts or image files. Only the markdown that
``render.render`` produces is converted (headings, paragraphs, lists, pipe tables, fenced code,
images, bold, inline code, links); a general markdown library would be a dependency for that.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #1a1a1a; background: #fff; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ddd; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 12px; max-width: 100%; }
th, td { border: 1px solid #ccc; padding: 2px 5px; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th { font-weight: 600; } td code { white-space: normal; }
details { margin: 0.6em 0; } summary { cursor: pointer; color: #2a6ebb; }
th { background: #f2f2f2; } tr:nth-child(even) td { background: #fafafa; }
code { background: #f4f4f4; padding: 0 3px; border-radius: 3px; }
pre { background: #f4f4f4; padding: 0.6em; overflow-x: auto; }
img { max-width: 100%; border: 1px solid #eee; }
#answer { background: #f3f8ff; border-left: 4px solid #2a6ebb; padding: 0.2em 1em; }
"""

# Nothing loads from anywhere: images are data: URIs, styles are the page's own; no script,
# no form, no base. Opened from disk or mailed to a reviewer, the page still cannot run code.
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'self'")
FOLD_ROWS = 10  # a table with more body rows than this is folded (<details>), closed
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_FIGURE = re.compile(r"plots/[A-Za-z0-9_-][A-Za-z0-9._-]*\.png")  # the report's own figures


def safe_href(href: str) -> bool:
    """A link target the page may carry: ``http(s)://``, ``#...`` or a relative path."""
    if any(ord(ch) < 0x20 or ch in "\\<>\"'`" for ch in href) or href.startswith("//"):
        return False
    if href.startswith(("http://", "https://", "#")):
        return True
    head = re.split(r"[/?#]", href, maxsplit=1)[0]
    return _SCHEME.match(href) is None and ":" not in head


def _link(m: re.Match) -> str:
    label, href = m.group(1), m.group(2)  # both already escaped
    if not safe_href(html.unescape(href)):
        return f"{label} ({href})"  # shown as text, never followed
    return f'<a href="{href}">{label}</a>'


_INLINE = [  # applied outside code spans, in this order, to escaped text
    (re.compile(r"\*\*(.+?)\*\*"), lambda m: f"<strong>{m.group(1)}</strong>"),
    (re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)"), _link),
]


def plain(value: str) -> str:
    """``value`` as HTML text: every markup character escaped, quotes too, one line."""
    return html.escape(" ".join(str(value).split()), quote=True)


def inline(text: str) -> str:
    """Escape ``text`` and apply the inline markup (code spans are not marked up further).

    Escaping comes first (``quote=True``), so markup can only come from the patterns here;
    a link whose target is not http(s), ``#`` or relative stays text.
    """
    codes: list[str] = []

    def stash(m: re.Match) -> str:  # code spans first, so `**` inside code stays literal
        codes.append(f"<code>{m.group(1)}</code>")
        return f"\x00{len(codes) - 1}\x00"

    out = re.sub(r"`([^`]+)`", stash, html.escape(text.replace("\x00", ""), quote=True))
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return re.sub(r"\x00(\d+)\x00", lambda m: codes[int(m.group(1))], out)


def _image(line: str, folder: Path) -> str:
    """One of the report's own figures (``plots/*.png`` in ``folder``), embedded; anything
    else is left out, with its alt text."""
    m = re.fullmatch(r"!\[([^\]]*)\]\(([^)]+)\)", line.strip())
    if m is None:  # not an image line after all (data that starts with "![")
        return f"<p>{inline(line)}</p>"
    alt, src = m.groups()
    path = folder / src
    if _FIGURE.fullmatch(src) and path.is_file() and not path.is_symlink() \
            and not (folder / "plots").is_symlink():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return (f'<p><img alt="{html.escape(alt, quote=True)}" '
                f'src="data:image/png;base64,{data}"></p>')
    return f"<p>(figure left out: {inline(alt)})</p>"


def note_markdown(markdown: str) -> str:
    """``markdown`` made safe for MLflow's own markdown renderer (``mlflow.note.content``).

    Angle brackets become entities (no raw HTML, no autolinks) and a link whose target is
    not http(s), ``#`` or relative is written as text.
    """
    out = markdown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def link(m: re.Match) -> str:
        ok = safe_href(html.unescape(m.group(2)))
        return m.group(0) if ok else f"{m.group(1)} ({m.group(2).replace('(', '[')})"

    return re.sub(r"\[([^\]]+)\]\(([^)\s]*)\)", link, out)


def _table(rows: list[str], fold: bool = True) -> str:
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", r.strip())[1:-1]]
             for r in rows]
    head, body = cells[0], cells[2:]  # cells[1] is the |---| separator
    out = ["<table><thead><tr>", *[f"<th>{inline(c)}</th>" for c in head], "</tr></thead><tbody>"]
    for r in body:
        out += ["<tr>", *[f"<td>{inline(c)}</td>" for c in r], "</tr>"]
    page = "".join([*out, "</tbody></table>"])
    if not fold or len(body) <= FOLD_ROWS:
        return page
    return (f"<details><summary>the table's {len(body)} rows (click to open)</summary>"
            f"{page}</details>")


def to_html(markdown: str, folder: Path, title: str) -> str:
    """The report page: ``markdown`` (as ``render.render`` writes it) with images from ``folder``.

    The ``## Answer`` section is wrapped in ``<section id="answer">`` so it stands out; a
    table of more than ``FOLD_ROWS`` rows outside it is folded (``<details>``) so the figures
    stay near the top (the answer's own table never is); cells wrap, so no table is wider
    than the page.
    """
    lines, out, i = markdown.splitlines(), [], 0
    in_answer = False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j]), quote=True)
                       + "</code></pre>")
            i = j + 1
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            if level == 2 and in_answer:
                out.append("</section>")
                in_answer = False
            if level == 2 and line[3:].strip() == "Answer":
                out.append('<section id="answer">')
                in_answer = True
            out.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
        elif line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(_table(lines[i:j], fold=not in_answer))  # the answer's table stays open
            i = j
            continue
        elif line.startswith("- "):
            j = i
            while j < len(lines) and lines[j].startswith("- "):
                j += 1
            out.append("<ul>" + "".join(f"<li>{inline(x[2:])}</li>" for x in lines[i:j])
                       + "</ul>")
            i = j
            continue
        elif line.startswith("!["):
            out.append(_image(line, folder))
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
        i += 1
    if in_answer:
        out.append("</section>")
    body = "\n".join(out)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{plain(title)}</title><style>{CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")
