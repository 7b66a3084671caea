#!/usr/bin/env python3
"""Tune a depthwise conv1d problem and freeze the winner into generated/ (the command line is search/cli.py)."""
from __future__ import annotations

import sys

from search.cli import main, run

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(run())
