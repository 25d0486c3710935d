"""Vision task heads: a small classifier on the LLM's last hidden state (paper §4.2.2)."""
