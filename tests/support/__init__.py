"""What tests of every app share: people, ready versions, deployments, calls through the gateway (a support
package: nothing here is collected, and no test imports a conftest module; conftest files only hand these out as
fixtures, tests/test_test_support.py checks both)."""
