"""The built-in plugins: registered through the same hooks as any installed plugin."""
