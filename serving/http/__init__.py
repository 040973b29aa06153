"""HTTP beside the UI: `POST /` shaped like the inference API (`api`), and Prometheus metrics (`metrics`)."""
