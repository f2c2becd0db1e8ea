"""Evidence-gated promotion: candidate -> shadow -> canary -> full, its settings, evaluators,
log replay, and the service the CLI and the admin endpoints share."""
