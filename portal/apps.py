from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Modelport settings"

    def ready(self) -> None:
        from portal import checks  # noqa: F401 - registers the settings' system checks
