# Shared by the .deb's and the .rpm's scripts (xtask/src/dist.rs puts it at
# the top of each).

# The value of KEY in this node's settings, else DEFAULT: its last
# assignment (without surrounding double quotes) in /etc/default/prjquota
# (the .deb's), then /etc/sysconfig/prjquota (the .rpm's), the order in
# which the unit reads them. The files are read, never run: they are
# systemd's EnvironmentFile syntax, not shell scripts.
prjquota_get() {
	v=$(cat /etc/default/prjquota /etc/sysconfig/prjquota 2>/dev/null | sed -n "s/^[[:space:]]*$1=//p" | tail -n 1 | sed 's/^"\(.*\)"$/\1/')
	echo "${v:-$2}"
}

# This node's settings, else Nomad's defaults.
prjquota_settings() {
	VOLUMES_DIR=$(prjquota_get VOLUMES_DIR /opt/nomad/data/host_volumes)
	PLUGIN_DIR=$(prjquota_get PLUGIN_DIR /opt/nomad/data/host_volume_plugins)
}

# Puts the package's plugin into Nomad's plugin directory when it exists,
# with `prjquota install` (plugin/src/admin/install.rs): a regular file
# (Nomad 2.0.1+ refuses a symlinked plugin) written beside the directory,
# flushed, then renamed over the old one, so that every create and delete
# Nomad starts meanwhile runs the old or the new plugin whole, and nothing
# else ever appears in the directory Nomad's fingerprint reads.
prjquota_install_plugin() {
	prjquota_settings
	if [ ! -d "$PLUGIN_DIR" ]; then
		echo "prjquota: $PLUGIN_DIR does not exist, so Nomad's plugin was not installed. Set PLUGIN_DIR in /etc/default/prjquota (/etc/sysconfig/prjquota on RPM systems) to the client's host_volume_plugin_dir (or create it), then reinstall the package or run: /usr/lib/prjquota/prjquota install --plugin-dir \"\$PLUGIN_DIR\"" >&2
		return 0
	fi
	/usr/lib/prjquota/prjquota install --plugin-dir "$PLUGIN_DIR"
}

# On remove: the plugin stays where Nomad runs it. Nomad runs it to delete
# the volumes it created, and a removed plugin would leave them undeletable
# (and their quotas set). Volumes and their data are never touched.
prjquota_plugin_notice() {
	prjquota_settings
	if [ -f "$PLUGIN_DIR/prjquota" ]; then
		echo "prjquota: left $PLUGIN_DIR/prjquota in place: Nomad needs it to delete the volumes it created. Once no volume is left (\`nomad volume status -type host\`; ls $VOLUMES_DIR), remove it with: rm $PLUGIN_DIR/prjquota" >&2
	fi
}

prjquota_systemd() {
	[ -d /run/systemd/system ]
}

# systemctl ACTION UNIT through deb-systemd-invoke where there is one (it
# asks policy-rc.d, and starts only an enabled unit), else systemctl
# (start only when enabled, as deb-systemd-invoke does).
prjquota_invoke() {
	if command -v deb-systemd-invoke >/dev/null 2>&1; then
		deb-systemd-invoke "$@"
	elif [ "$1" != start ] || systemctl --quiet is-enabled "$2"; then
		systemctl "$@"
	fi
}
