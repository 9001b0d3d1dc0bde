"""Device maps: the ``DeviceMap`` value, coverage checks against a model, the JSON file format.

Modules (each imports only those before it):

- ``value``: ``DeviceMap`` (normalised once, immutable), ``covering_key`` / ``device_for`` (the
  one "longest covering key wins" lookup), ``normalize_device_map``, ``clean_device_map``.
- ``coverage``: which device a map gives each tensor of a model (``resolve_device_map``,
  ``check_device_map``, ``covering_devices``, ``check_map_keys``), tied parameter groups.
- ``files``: ``save_device_map``, ``load_device_map``, ``read_device_map`` and the wrapped
  ``workbench-device-map`` format with its model record.

Import names from their module (or from ``workbench.big_modeling``).
"""
