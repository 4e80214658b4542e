"""Errors jaxoff raises for bad input: each message says what happened and what to do."""


class JaxoffError(Exception):
    """Base class of jaxoff's own errors."""


class ConfigError(JaxoffError, ValueError):
    """A configuration value is wrong; the message names the option and the fix."""
