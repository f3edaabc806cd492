"""Adapters that plug Warren into agent and RL harnesses, each behind an optional extra.

- :mod:`warren.integrations.minisweagent`: a mini-swe-agent ``Environment``
  (``pip install 'warren-sandbox[minisweagent]'``).
- :mod:`warren.integrations.harbor`: a Harbor ``BaseEnvironment``
  (``pip install 'warren-sandbox[harbor]'``, Python 3.12 or newer).

Importing this package imports none of the harnesses.
"""
