"""docs/families.md is generated (``python -m profiling families``, ``make families``) from rome's
family tables: ``_FAMILIES``, ``_CLASSES`` and ``_REFUSED`` of rome/integrations/transformers.py,
``_FAMILIES``, ``REFUSED`` and ``NO_ROPE`` of rome/integrations/diffusers.py and the rotary
functions of rome/integrations/_diffusers_rope.py, with the words of profiling/families.py.

- the committed page is what the command writes now: a family added to, or refused by, the code
  without regenerating the page fails here;
- every family of those tables has its words (display name) in profiling/families.py;
- the page reads nothing of the installed transformers or diffusers (the same page whichever
  versions, or none, are installed): generating it twice, and with the libraries' modules hidden,
  gives the same text.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from profiling import families

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "families.md"


def test_committed_page_is_what_the_command_writes():
    assert PAGE.read_text(encoding="utf-8") == families.generate(), (
        "docs/families.md is not what `python -m profiling families` writes from rome's family tables: "
        "regenerate it (make families) and commit it with the code change"
    )


def test_every_family_has_its_words():
    assert families.missing_names() == []


def test_command_writes_the_page(tmp_path):
    out = tmp_path / "families.md"
    families.main(type("Args", (), {"out": str(out)}))
    assert out.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")


def test_page_does_not_depend_on_the_installed_libraries():
    """The generator run where transformers and diffusers cannot be imported writes the same page."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('transformers', 'diffusers'):\n"
        "            raise ImportError(f'{name} hidden')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from profiling import families\n"
        "sys.stdout.write(families.generate())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, env=env)
    assert out.stdout == PAGE.read_text(encoding="utf-8")
