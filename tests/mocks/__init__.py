"""Stand-ins for hosted providers' HTTP APIs, run on real sockets with `ServerThread`.

The OpenAI-shaped provider needs no mock of its own: the simulator (`gateway.sim`) is
an OpenAI-compatible server. `anthropic_mock` speaks Anthropic's Messages API.
"""
