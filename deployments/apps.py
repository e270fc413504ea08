from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"
    verbose_name = "Deployments"

    def ready(self) -> None:
        from deployments import (
            checks,  # noqa: F401 - registers the system checks
            usage,  # noqa: F401 - answers the registry's version_users
        )
        from deployments.runtimes import registry

        registry.connect_receivers()  # the local runtime answers the registry's python_trial_call
