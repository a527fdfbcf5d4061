"""Plain helpers the whole suite shares: factories, process starters, the test catalog.

Fixtures stay in ``conftest.py`` files; everything a test or another helper imports lives
here (or in a module beside the one directory that uses it), never in a conftest.
"""

from __future__ import annotations

from pathlib import Path

# The repository root: the working directory of every process a test starts.
ROOT = Path(__file__).resolve().parents[2]
