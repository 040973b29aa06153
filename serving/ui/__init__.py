"""The Gradio UI and named API: panels, formatting, pool views, comparisons, the launch of one server."""
