"""``python -m backendconf_torchscript_reference``: build (or find in the cache) both libraries, print their paths.

``make`` runs it before the tests, so that a clean build (about 30 s each)
never counts against a test run's time.
"""

from ._build import broken_library_path, library_path

print(library_path())
print(broken_library_path())
