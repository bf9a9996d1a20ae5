"""An emulated cluster on one Linux machine: network namespaces joined by tc-shaped veth links.

``topology`` (the pure plan: names, addresses, ``ip``/``tc`` steps), ``netns`` (running them, with
a cleanup stack and a reaper for crashed runs), ``launcher`` (one torchrun agent per node),
``cli`` (``semimig cluster``).  Nothing is imported here: ``semimig``'s CLI loads ``cli`` only.
"""
