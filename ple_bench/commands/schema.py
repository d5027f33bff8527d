"""``schema``: the record schema as markdown (docs/schema.md)."""

from __future__ import annotations

import argparse
import sys

from ..record import markdown


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("schema", help="print the record schema as markdown (docs/schema.md)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    sys.stdout.write(markdown())
    return 0
