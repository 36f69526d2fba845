"""Conversion routes: one module per route; ``registry.build`` picks the route for a request."""
