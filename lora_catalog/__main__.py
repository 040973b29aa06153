"""Command line: `python -m lora_catalog refresh|list ...`.

    refresh --base <repo id> [--limit N] [--out PATH]        write a snapshot from the Hub
    list    --base <repo id> [--search TEXT] [--sort S] [--limit N] [--json]
            [--snapshot PATH] [--local-dir DIR] [--offline]  print LoRAs (from the snapshot if the Hub is down)

The Hub endpoint is huggingface_hub's (HF_ENDPOINT) unless --endpoint names one.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .bases import DEFAULT_BASE
from .catalog import Catalog
from .entries import LoraEntry
from .errors import CatalogError, HubUnavailableError
from .hub import SORTS, HubSource
from .listing import CatalogPage
from .snapshot import default_snapshot_path

_MAX_PAGE = 200


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return _refresh(args) if args.command == "refresh" else _list(args)
    except CatalogError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lora_catalog", description="The LoRA catalogue.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("refresh", "write a snapshot from the Hub"), ("list", "print LoRAs for a base")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--base", default=DEFAULT_BASE, help=f"base model repo id (default {DEFAULT_BASE})")
        command.add_argument("--limit", type=_positive, default=300 if name == "refresh" else 24)
        command.add_argument("--endpoint", default=None, help="Hub URL (default: huggingface_hub's)")
        command.add_argument("--timeout", type=float, default=10.0, help="seconds per Hub request")
    commands.choices["refresh"].add_argument("--out", type=Path, default=None, help="snapshot file to write")
    listing = commands.choices["list"]
    listing.add_argument("--search", default="")
    listing.add_argument("--sort", choices=SORTS, default="downloads")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.add_argument("--snapshot", type=Path, default=None, help="snapshot to fall back to")
    listing.add_argument("--local-dir", type=Path, action="append", default=[], help="folder of local LoRAs")
    listing.add_argument("--offline", action="store_true", help="do not contact the Hub")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; accepted: an integer from 1")
    return value


def _refresh(args: argparse.Namespace) -> int:
    out = args.out or default_snapshot_path(args.base)
    hub = HubSource(endpoint=args.endpoint, timeout_s=args.timeout)
    with Catalog(hub, refresh=False, list_limit=args.limit) as catalog:
        snapshot = catalog.save_snapshot(out, args.base)
    print(f"wrote {len(snapshot.entries)} LoRAs for {snapshot.base} to {out}", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    snapshot = args.snapshot or default_snapshot_path(args.base)
    hub = None if args.offline else HubSource(endpoint=args.endpoint, timeout_s=args.timeout)
    with Catalog(
        hub,
        snapshot_path=snapshot if snapshot.exists() or args.snapshot else None,
        local_dirs=args.local_dir,
        refresh=False,
        list_limit=max(args.limit, 1),
    ) as catalog:
        if hub is not None:
            try:
                catalog.refresh_now(args.base, search=args.search, sort=args.sort)
            except HubUnavailableError as e:
                print(f"warning: the Hub is unreachable ({e}); listing from the snapshot", file=sys.stderr)
        pages = _pages(catalog, args)
    if pages[0].freshness.source == "none" and pages[0].freshness.offline:
        print(f"error: nothing to list: {pages[0].freshness.message}", file=sys.stderr)
        return 1
    entries = [e for p in pages for e in p.entries][: args.limit]
    freshness = pages[0].freshness
    if freshness.offline:
        print(f"note: {freshness.message}", file=sys.stderr)
    if args.json:
        document = {
            "base": args.base,
            "freshness": {
                "source": freshness.source,
                "updated_at": freshness.updated_at.isoformat() if freshness.updated_at else None,
                "offline": freshness.offline,
                "message": freshness.message,
            },
            "entries": [e.to_json() for e in entries],
        }
        print(json.dumps(document, indent=1, ensure_ascii=False))
    else:
        for entry in entries:
            print(_row(entry))
    return 0


def _pages(catalog: Catalog, args: argparse.Namespace) -> list[CatalogPage]:
    size = min(args.limit, _MAX_PAGE)
    pages = [catalog.page(args.base, search=args.search, sort=args.sort, page=0, page_size=size)]
    while pages[-1].has_more and len(pages) * size < args.limit:
        pages.append(catalog.page(args.base, search=args.search, sort=args.sort, page=len(pages), page_size=size))
    return pages


def _row(entry: LoraEntry) -> str:
    flags = " [non-commercial]" if entry.non_commercial else ""
    return f"{entry.ref}\t{entry.downloads}\t{entry.likes}\t{entry.license or '-'}{flags}\t{entry.title}"


if __name__ == "__main__":
    sys.exit(main())
