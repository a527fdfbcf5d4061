"""What only development needs: the ``make up`` launcher and its embedded servers, the
simulator and the Stripe emulator. Production never imports this package; the image does
not ship it (see the Dockerfile)."""
