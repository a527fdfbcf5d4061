"""Tenants' protection policies: the settings' default, stored versions, the one in force."""
