"""Device reports: where they are stored and what the canary analysis reads of them."""
