"""Where a kubeseer process finds its API server: one rule for the operator, the extender and
the profiler, so that `--kubeconfig` and an in-cluster service account mean the same to each.

A path given is the only source tried. Without one, the in-cluster service account comes first
(how every component runs when deployed) and, where `fall_back` allows, then the default
kubeconfig (how a person runs it from a checkout). Each caller turns `CredentialsError` into its
own configuration error.
"""

from __future__ import annotations

import kubernetes.client
import kubernetes.config


class CredentialsError(Exception):
    """No usable credentials; the message names the sources tried."""


def configuration(
    kubeconfig: str | None, *, fall_back: bool = True
) -> kubernetes.client.Configuration:
    """The client configuration from `kubeconfig`, else in-cluster, else (with `fall_back`)
    ~/.kube/config.

    Raises:
        CredentialsError: none of the sources tried could be used.
    """
    loaded = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=loaded
            )
        elif not fall_back:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=loaded
            )
        else:
            try:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=loaded
                )
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    client_configuration=loaded
                )
    except (kubernetes.config.ConfigException, OSError) as e:
        where = kubeconfig or (
            "the in-cluster service account or ~/.kube/config"
            if fall_back
            else "the in-cluster service account"
        )
        raise CredentialsError(f"cannot use {where} to reach the API server: {e}") from e
    return loaded
