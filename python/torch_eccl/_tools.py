"""The eccl-run and ecclcoord programs a pip-installed torch_eccl carries
(in torch_eccl/bin), as console scripts."""

from __future__ import annotations

import os
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _exec(name: str) -> None:
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        sys.exit(f"torch_eccl: {path} is missing: this torch_eccl was not installed by pip "
                 f"(a build tree has {name} under <build>/bootstrap)")
    os.execv(path, [name, *sys.argv[1:]])


def eccl_run() -> None:
    _exec("eccl-run")


def ecclcoord() -> None:
    _exec("ecclcoord")
