"""The admin REST app: one module per resource group, one error class."""
