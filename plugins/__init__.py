"""Built-in plugins, registered through entry points exactly like third-party ones."""
