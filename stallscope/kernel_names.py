"""Kernel-name normalising shared by ingest (pairing ncu results) and analyzers."""

from __future__ import annotations

import re

_NESTED = re.compile(r"<[^<>]*>|\([^()]*\)")


def kernel_base_name(name: str) -> str:
    """``void ns::kern<T>(int)`` -> ``kern``: the function name alone, for cross-tool matching."""
    text = name.strip().replace("(anonymous namespace)", "anon").replace("<unnamed>", "anon")
    previous = None
    while previous != text:
        previous, text = text, _NESTED.sub("", text)
    text = text.strip().split()[-1] if text.strip() else name.strip()
    return text.rsplit("::", 1)[-1]
