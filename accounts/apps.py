from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Teams, users and API tokens"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from accounts import checks, signin

        checks.register()
        user_logged_in.connect(signin.mark_signed_in, dispatch_uid="accounts.signin.mark_signed_in")
