"""The method run on real engines: fitting a direction, distilling it, and the evaluation runner.

It may import ``heterofold`` and ``engines``, never ``store``, ``gateway``, ``dashboard``, ``bench``
or ``cli``.
"""
