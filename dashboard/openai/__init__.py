"""The OpenAI-compatible door under ``/v1/``: what OpenAI's clients call,
answered in OpenAI's shapes (its list, its errors), authenticated with this
system's API tokens. A request's ``model`` names a route or a single provider
(``governance.services.routes``)."""
