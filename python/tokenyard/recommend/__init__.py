"""``tokenyard recommend``: from a model, GPUs, a load and SLOs to a verified, launchable
deployment."""
