"""Outbound webhooks (issue #16, docs/webhooks.md), signed per the Standard Webhooks spec.

* ``endpoints``: a tenant's endpoints and their secrets (``secrets``), admins only;
* ``fanout``: each notification (``metering.notifications``) becomes one message per
  matching endpoint, its body frozen (``payload``);
* ``delivery``: claim with a lease, check the target (``targets``), sign (``signing``),
  send through the caller's HTTP client, record; retries by ``schedule``;
* ``log``: the delivery log and redelivery.

The HTTP client itself is the worker's (``reconciler/webhook_sender.py``): the domain
sends no request of its own.
"""
