"""Knative Eventing, emulated in-process: the Broker and its Triggers (read from the real
manifests under knative/), ApiServerSource, PingSource, and the event sink tests read."""
