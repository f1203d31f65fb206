"""Write the gateway settings tables (gateway/settings.py) into docs/operations.md, between its settings markers.

Run from the checkout root: `python -m scripts.settings_doc` (`make docs-settings`); `--check` changes nothing and
exits 1 when the doc differs from the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.settings import with_settings_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def main(argv: list[str]) -> int:
    current = DOC.read_text()
    wanted = with_settings_table(current)
    if "--check" in argv:
        if wanted != current:
            print(f"{DOC}: the settings tables differ from gateway/settings.py; run `make docs-settings`")
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
