"""Who may connect and what they may do: the broker's authentication and authorization.

- ``password_hashes``: salted slow password hashes (scrypt; mosquitto's "$7$" and "$6$" verified);
- ``users``: the password file and ``Authenticator``, the CONNECT decision (MQTT 5.0 §3.1.3.5-6);
- ``acl``: ``Acl``, topic authorization as mosquitto's ``acl_file`` (MQTT 5.0 §5.4.2);
- ``files``: reading a password or ACL file, ``AuthFileError`` when one cannot be read or parsed;
- ``from_config``: ``build_access``, both from the broker's ``auth`` configuration;
- ``dynamic_auth``: the users and ACL sections the admin API writes, as retained records (pure);
- ``passwd``: ``skipmq passwd``, the password-file tool (``python -m broker.auth.passwd``).
"""
