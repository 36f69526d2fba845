"""Getting a bundle onto devices: the bundle's layout, the push (SFTP or one streamed exec channel), the atomic
install and its lock, rollback and pruning, runtime set-up on the device, and Mender artifacts for fleets that
deploy through a Mender server.
"""
