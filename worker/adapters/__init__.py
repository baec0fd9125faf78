"""Adapters: inbound records (our envelope or a vendor's own stream events) to internal chunks."""
