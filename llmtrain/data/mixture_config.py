"""Names of a data=mix mixture's sources, as metrics, logs and checks call them."""

from __future__ import annotations

import os


def source_names(sources) -> list[str]:
    """Each source's `name`, else the stem of its path (`code.bin` -> `code`, `web/` -> `web`)."""
    names = []
    for source in sources:
        if source.get("name"):
            names.append(str(source["name"]))
            continue
        base = os.path.basename(os.path.normpath(os.path.expanduser(str(source["path"]))))
        names.append(base.split(".", 1)[0] if "." in base[1:] else base)
    return names
