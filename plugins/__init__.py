"""Bundled Postroom plugins; every module here is imported by discovery.

This is a ``twisted.plugin`` package: installed packages may add modules to it.
"""

from twisted.plugin import pluginPackagePaths

__path__.extend(pluginPackagePaths(__name__))
__all__: list[str] = []
