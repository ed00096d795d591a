# Shared by the .deb's and the .rpm's scripts (xtask/src/dist.rs puts it at
# the top of each).

# The value of KEY in /etc/default/prjquota (its last assignment, without
# surrounding double quotes), else DEFAULT. The file is read, never run: it
# is systemd's EnvironmentFile syntax, not a shell script.
prjquota_get() {
	v=
	if [ -r /etc/default/prjquota ]; then
		v=$(sed -n "s/^[[:space:]]*$1=//p" /etc/default/prjquota | tail -n 1 | sed 's/^"\(.*\)"$/\1/')
	fi
	echo "${v:-$2}"
}

# This node's settings: /etc/default/prjquota, else Nomad's defaults.
prjquota_settings() {
	VOLUMES_DIR=$(prjquota_get VOLUMES_DIR /opt/nomad/data/host_volumes)
	PLUGIN_DIR=$(prjquota_get PLUGIN_DIR /opt/nomad/data/host_volume_plugins)
}

# Puts the package's plugin into Nomad's plugin directory when it exists:
# a regular file (Nomad 2.0.1+ refuses a symlinked plugin), written under a
# temporary name in the same directory, flushed, then renamed over the old
# one. Nomad starts the plugin for every create and delete; a rename swaps
# the file in one step, so every run gets the old or the new plugin whole
# (`install` alone unlinks the target first, and a run in between fails).
prjquota_install_plugin() {
	prjquota_settings
	if [ ! -d "$PLUGIN_DIR" ]; then
		echo "prjquota: $PLUGIN_DIR does not exist, so Nomad's plugin was not installed. Set PLUGIN_DIR in /etc/default/prjquota to the client's host_volume_plugin_dir (or create it), then reinstall the package or run: install -m 0755 /usr/lib/prjquota/prjquota \"\$PLUGIN_DIR/.prjquota.new\" && sync \"\$PLUGIN_DIR/.prjquota.new\" && mv -f \"\$PLUGIN_DIR/.prjquota.new\" \"\$PLUGIN_DIR/prjquota\"" >&2
		return 0
	fi
	tmp="$PLUGIN_DIR/.prjquota.new"
	install -m 0755 -o root -g root /usr/lib/prjquota/prjquota "$tmp"
	sync "$tmp"
	mv -f "$tmp" "$PLUGIN_DIR/prjquota"
	echo "prjquota: installed the plugin as $PLUGIN_DIR/prjquota ($(/usr/lib/prjquota/prjquota --version))"
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
