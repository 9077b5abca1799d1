"""The reference of benchmark 10 (bench/models.py): the model layer as it was before pydantic.

`records.py` is `events/records.py` at ea6cec3, verbatim; `resources.py` declares the vllm
LoRAAdapter on it exactly as `functions/resources/` did, and `adapters_listed` is how
`functions/adapters/engines.py` read a `GET /v1/models` answer. Kept so that every run measures
the production models against the old ones on the same machine in the same minute (this
machine's speed drifts by 1.5x within minutes); nothing outside bench/models.py imports it.
"""
