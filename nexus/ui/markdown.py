"""Safe Markdown: a README written by anyone who can upload a file, shown on a page.

Every character of the source is escaped first; only the markup below becomes HTML, and only
tags written here: raw HTML (a `<script>`, an `onerror=`) stays visible text, and links go to
http(s), mailto or relative addresses only. No dependency: the subset READMEs use is small, and
a full Markdown library would need a sanitizer after it.

Blocks: `#` headings, paragraphs, `-`/`*`/`1.` lists, ``` fenced code, `>` quotes, `---` rules.
Inline: `code`, **strong**, *emphasis*, [links](url).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

_HEADING = re.compile(r"(#{1,6})\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"\s{0,3}[-*+]\s+(.*)")
_NUMBERED = re.compile(r"\s{0,3}\d{1,9}[.)]\s+(.*)")
_FENCE = re.compile(r"\s{0,3}(```|~~~)")
_RULE = re.compile(r"\s{0,3}([-*_])(\s*\1){2,}\s*$")
_QUOTE = re.compile(r"\s{0,3}>\s?(.*)")
_CODE_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_STRONG = re.compile(r"\*\*(.+?)\*\*|__(.+?)__")
_EMPHASIS = re.compile(
    r"(?<![*\w])\*(?!\s)(.+?)(?<!\s)\*(?![*\w])"  # *em*, not inside a word
    r"|(?<!\w)_(?!\s)(.+?)(?<!\s)_(?!\w)"  # _em_, not snake_case
)
_SAFE_URL = re.compile(r"(https?://|mailto:|/|\.{0,2}/|#)|[^:]*$", re.IGNORECASE)
# Code spans are set aside while the other inline rules run, so their text stays literal.
_HOLD = "\x00{}\x00"


def render(source: str) -> str:
    """Return the Markdown source as HTML that holds only this module's own tags."""
    return "\n".join(_blocks(source.replace("\r\n", "\n").split("\n")))


def _blocks(lines: list[str]) -> Iterator[str]:
    index = 0
    paragraph: list[str] = []

    def flush() -> Iterator[str]:
        if paragraph:
            yield f"<p>{inline(' '.join(line.strip() for line in paragraph))}</p>"
            paragraph.clear()

    while index < len(lines):
        line = lines[index]
        if not line.strip():
            yield from flush()
            index += 1
            continue
        if fence := _FENCE.match(line):
            yield from flush()
            code = []
            index += 1
            while index < len(lines) and not lines[index].lstrip().startswith(fence.group(1)):
                code.append(lines[index])
                index += 1
            index += 1  # the closing fence (or the end of the text)
            yield f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>"
            continue
        if heading := _HEADING.match(line):
            yield from flush()
            level = len(heading.group(1))
            yield f"<h{level}>{inline(heading.group(2))}</h{level}>"
        elif _RULE.match(line):
            yield from flush()
            yield "<hr>"
        elif _QUOTE.match(line):
            yield from flush()
            quoted = []
            while index < len(lines) and (quote := _QUOTE.match(lines[index])):
                quoted.append(quote.group(1))
                index += 1
            yield f"<blockquote>{''.join(_blocks(quoted))}</blockquote>"
            continue
        elif _BULLET.match(line) or _NUMBERED.match(line):
            yield from flush()
            pattern, tag = (_BULLET, "ul") if _BULLET.match(line) else (_NUMBERED, "ol")
            items = []
            while index < len(lines) and (item := pattern.match(lines[index])):
                items.append(f"<li>{inline(item.group(1))}</li>")
                index += 1
            yield f"<{tag}>{''.join(items)}</{tag}>"
            continue
        else:
            paragraph.append(line)
        index += 1
    yield from flush()


def inline(text: str) -> str:
    """Return one line's inline Markdown as HTML, everything else escaped."""
    held: list[str] = []

    def hold(fragment: str) -> str:
        held.append(fragment)
        return _HOLD.format(len(held) - 1)

    text = _CODE_SPAN.sub(lambda m: hold(f"<code>{html.escape(m.group(1))}</code>"), text)
    text = html.escape(text)
    text = _LINK.sub(_link, text)
    text = _STRONG.sub(lambda m: f"<strong>{m.group(1) or m.group(2)}</strong>", text)
    text = _EMPHASIS.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", text)
    return re.sub("\x00(\\d+)\x00", lambda m: held[int(m.group(1))], text)


def _link(match: re.Match[str]) -> str:
    label, url = match.group(1), html.unescape(match.group(2))
    if not _SAFE_URL.match(url):
        # javascript:, data: and the like: the text stays, the link goes.
        return label
    return f'<a href="{html.escape(url)}" rel="nofollow noopener">{label}</a>'
