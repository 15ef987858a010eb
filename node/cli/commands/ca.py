"""``murmur ca init|issue|revoke``: a swarm CA, the node certificates it issues for mutual TLS,
and the signed list of the nodes it revoked."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from node.cli.commands.shared import HelpFormatter, fail

__all__ = ["add_parser", "cmd_ca_init", "cmd_ca_issue", "cmd_ca_revoke"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur ca`` and its commands ``init``, ``issue`` and ``revoke`` to ``sub``."""
    p = sub.add_parser(
        "ca",
        parents=[common],
        formatter_class=HelpFormatter,
        help="make a swarm CA and issue node certificates for mutual TLS",
    )
    ca = p.add_subparsers(dest="ca_command", required=True)
    init = ca.add_parser(
        "init",
        parents=[common],
        formatter_class=HelpFormatter,
        help="make a CA: DIR/ca_key.pem (mode 0600) and DIR/ca_cert.pem",
    )
    init.add_argument("dir", type=Path, metavar="DIR")
    init.add_argument("--name", default="murmur swarm", metavar="NAME", help="the CA's common name")
    init.set_defaults(func=cmd_ca_init)
    issue = ca.add_parser(
        "issue",
        parents=[common],
        formatter_class=HelpFormatter,
        help="issue a node certificate (keeps the node key, and id, already in OUT)",
    )
    issue.add_argument("dir", type=Path, metavar="DIR", help="the CA dir")
    issue.add_argument("name", metavar="NAME", help="a label for the node")
    issue.add_argument(
        "--out", type=Path, metavar="OUT", help="the node's state dir (default: DIR/NAME)"
    )
    issue.add_argument("--days", type=int, default=365, metavar="N", help="validity in days")
    issue.add_argument(
        "--admin",
        action="store_true",
        help="an admin's certificate: it may also pause and resume any node (murmur ctl)",
    )
    issue.set_defaults(func=cmd_ca_issue)
    revoke = ca.add_parser(
        "revoke",
        parents=[common],
        formatter_class=HelpFormatter,
        help="revoke nodes: a new signed DIR/revoked.json to drop into any node's dir",
    )
    revoke.add_argument("dir", type=Path, metavar="DIR", help="the CA dir")
    revoke.add_argument(
        "node_ids",
        nargs="+",
        metavar="NODE_ID",
        help="a node id, or the first characters (at least 4) of one this CA issued",
    )
    revoke.set_defaults(func=cmd_ca_revoke)


def cmd_ca_init(args: argparse.Namespace) -> int:
    """Make a CA in DIR; exit 2 if it could not."""
    from node.security.pki import CA_CERT_FILE, CA_KEY_FILE, init_ca

    try:
        init_ca(args.dir, name=args.name)
    except (ValueError, OSError) as err:
        return fail("ca init", err)
    print(
        f"wrote {args.dir / CA_KEY_FILE} (mode 0600, keep it secret) and {args.dir / CA_CERT_FILE}"
    )
    return 0


def cmd_ca_issue(args: argparse.Namespace) -> int:
    """Issue a node certificate into OUT; exit 2 if it could not."""
    from node.security.pki import CA_CERT_FILE, CERT_FILE, KEY_FILE, issue_node

    if args.out is None and (args.name in ("", ".", "..") or "/" in args.name):
        return fail("ca issue", f"{args.name!r} cannot name a dir; give --out")
    out: Path = args.out if args.out is not None else args.dir / args.name
    had_key = (out / KEY_FILE).exists()
    try:
        node_id = issue_node(args.dir, out, args.name, days=args.days, admin=args.admin)
    except (ValueError, OSError) as err:
        return fail("ca issue", err)
    key = f"{out / KEY_FILE} ({'kept' if had_key else 'new'}, mode 0600)"
    print(f"wrote {out / CERT_FILE} and {out / CA_CERT_FILE}; key {key}")
    print(f"node id {node_id}" + (" (admin)" if args.admin else ""))
    return 0


def cmd_ca_revoke(args: argparse.Namespace) -> int:
    """Revoke nodes by id; exit 2 if it could not."""
    from node.security.pki import issued_nodes, resolve_node_id
    from node.security.revocation import REVOKED_FILE, revoke

    try:
        ids = [resolve_node_id(args.dir, i) for i in args.node_ids]
        revocations = revoke(args.dir, ids)
        issued = issued_nodes(args.dir)
    except (ValueError, OSError) as err:
        return fail("ca revoke", err)
    for node_id in ids:
        name = issued.get(node_id, {}).get("name")
        print(f"revoked {node_id}" + (f" ({name})" if name else " (not issued by this CA)"))
    print(
        f"wrote {args.dir / REVOKED_FILE} (version {revocations.version}, "
        f"{len(revocations.node_ids)} node(s)); copy it into any live node's state dir: "
        "the swarm passes it on"
    )
    return 0
