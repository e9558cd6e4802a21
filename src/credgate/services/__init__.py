"""The domain: plain async functions over a `Context`, one module per concept."""
