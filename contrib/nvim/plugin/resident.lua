-- The commands of the resident plugin; the modules load on first use.
if vim.g.loaded_resident ~= nil then
  return
end
vim.g.loaded_resident = 1

vim.api.nvim_create_user_command('Resident', function(o)
  require('resident').reply(o.args, o.range, o.line1, o.line2)
end, { nargs = '*', range = true, desc = 'resident: stream a reply to a prompt (and the selection) into a buffer' })

vim.api.nvim_create_user_command('ResidentChat', function(o)
  require('resident.chat').open(o.args)
end, { nargs = '?', complete = function(lead)
  return require('resident.chat').complete(lead)
end, desc = 'resident: open a new chat session, or resume the one named' })

vim.api.nvim_create_user_command('ResidentStop', function()
  require('resident').stop()
end, { nargs = 0, desc = 'resident: cancel the reply being generated' })
