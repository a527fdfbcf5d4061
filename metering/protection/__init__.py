"""The cost of protection: what the rules credited, and what that usage cost the platform.

``report`` folds settled runs into per-customer and total figures (pure), ``attribution``
names the rule that credited each line (pure, from the policy's own rule functions),
``query`` reads a tenant's period from the database, ``export`` writes the CSV.
"""
