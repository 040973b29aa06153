"""Where generation happens: this process's pools (`local`) or a Ray Serve cluster (`remote`)."""
