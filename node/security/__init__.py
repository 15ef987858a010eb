"""Who a node is and whom it trusts: identities, the CA, signed records, revocations, penalties."""
