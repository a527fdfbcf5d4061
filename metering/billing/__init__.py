"""Stripe metered billing: outbox planning (pure), the gateway, the pusher, webhooks, drift."""
