"""A swarm's certificates: a CA of its own, and per-node certificates bound to node ids.

Every node runs mutual TLS with a certificate from the swarm's CA. Nodes dial each other by
IP:port, which no certificate can list in advance, so every node certificate carries the one DNS
name ``TLS_NAME`` and clients override the target name to it; who is at the other end is then
checked by node id, the hash of the public key in the certificate the peer presented
(``node_id_of_cert``).

This module gathers the public names of the two that do the work:

* :mod:`node.security.ca`, the operator's side: making the CA (``init_ca``), issuing node and
  admin certificates from it (``issue_node``), and the list of what it issued
  (``issued_nodes``, ``resolve_node_id``).
* :mod:`node.security.certificates`, the running node's side: what a node certificate holds
  (``TLS_NAME``, the file names), reading a node's TLS material (``load_tls``), and checking the
  certificates peers present (``check_node_certificate``, ``NodeCertificates``).
"""

from __future__ import annotations

from node.security.ca import (
    CA_KEY_FILE,
    ISSUED_FILE,
    init_ca,
    issue_node,
    issued_nodes,
    resolve_node_id,
)
from node.security.certificates import (
    CA_CERT_FILE,
    CERT_FILE,
    TLS_NAME,
    CertificateExpired,
    CertificateRefused,
    NodeCertificates,
    TlsFiles,
    check_node_certificate,
    is_admin_certificate,
    load_tls,
    node_id_of_cert,
)
from node.security.identity import KEY_FILE

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CERT_FILE",
    "ISSUED_FILE",
    "KEY_FILE",
    "TLS_NAME",
    "CertificateExpired",
    "CertificateRefused",
    "NodeCertificates",
    "TlsFiles",
    "check_node_certificate",
    "init_ca",
    "is_admin_certificate",
    "issue_node",
    "issued_nodes",
    "load_tls",
    "node_id_of_cert",
    "resolve_node_id",
]
