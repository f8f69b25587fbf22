"""Trace- and user-controlled text shown literally by Streamlit (never as Markdown or HTML).

Kernel names, op names, file names, job names, uploader names, tags and notes
come from traces and visitors: ``![x](http://host/pixel)`` in a kernel name
must print as those characters, not load an image or render a link.

Two ways, one function each:

* :func:`literal` -- prose: the text in the page's font, every Markdown-special
  character escaped (titles, names, notes inside a sentence);
* :func:`code_span` -- a message shown verbatim in monospace (SQL errors echo the
  query, so they keep its exact characters, backticks included);
* :func:`finding_text` -- a finding's title, detail or fix: the analyzers quote
  names from the trace in backticks (`` `aten::item` ``); those show as code,
  the rest as :func:`literal` prose.
"""

from __future__ import annotations

import re

_MARKDOWN_SPECIALS = "\\`*_{}[]()<>#!|$~:"
# GFM turns bare URLs into links after parsing, where escapes are gone: a zero-width space
# inside ``://`` and after ``www`` breaks the pattern and prints the same.
_AUTOLINK = re.compile(r"(?i)(?<=:)(?=//)|(?<=\bwww)(?=\.)")


def literal(text: object) -> str:
    """``text`` with every Markdown-special character backslash-escaped (one line), ``:`` too
    (no ``:red[x]`` directive), and bare URLs kept from becoming links."""
    line = _AUTOLINK.sub("\u200b", str(text).replace("\n", " "))
    return "".join("\\" + char if char in _MARKDOWN_SPECIALS else char for char in line)


def code_span(text: object) -> str:
    """``text`` as one inline Markdown code span, shown exactly as typed (one line).

    Code span content is never parsed: not ``![x](url)``, ``<img>``, emphasis or
    ``$math$``, and not the bare ``http://`` autolinks that Streamlit's GFM adds
    after parsing (escapes and character references cannot stop those). The
    fence is one backtick longer than any backtick run in ``text``; the padding
    spaces are dropped by CommonMark. Newlines become spaces (messages are one line).
    """
    line = " ".join(str(text).split("\n"))
    fence = "`" * (max((len(run) for run in re.findall("`+", line)), default=0) + 1)
    return f"{fence} {line} {fence}"


_QUOTED = re.compile(r"`([^`\n]+)`")


def finding_text(text: object) -> str:
    """An analyzer's sentence for Markdown: its backtick-quoted names as code spans
    (:func:`code_span`), everything between them as :func:`literal` prose. Safe for any
    name a trace holds: each piece is either escaped or a code span (never parsed)."""
    line = str(text).replace("\n", " ")
    out, pos = [], 0
    for quoted in _QUOTED.finditer(line):
        out.append(literal(line[pos : quoted.start()]))
        out.append(code_span(quoted.group(1)))
        pos = quoted.end()
    out.append(literal(line[pos:]))
    return "".join(out)
