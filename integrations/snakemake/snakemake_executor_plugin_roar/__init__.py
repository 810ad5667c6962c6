"""placeholder: replaced by the integration."""
